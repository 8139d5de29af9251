"""mkdocs hook: the package's source files are part of the site.

The pages link to the sources as they sit in the repository (``../src/dpex/workers/pool.py`` from
``docs/``), which is what works on GitHub. This hook adds each ``src/dpex/**/*.py`` under
that same path, so the links resolve on the built site as well and ``mkdocs build
--strict`` fails on a link to a source file that does not exist.
"""

import os

from mkdocs.structure.files import File, InclusionLevel


def on_files(files, config):
    docs = config["docs_dir"]
    root = os.path.join(os.path.dirname(docs), "src", "dpex")
    for folder, folders, names in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(docs))
            rel = rel.replace(os.sep, "/")
            files.append(File("../" + rel, docs, config["site_dir"],
                              config["use_directory_urls"], dest_uri=rel,
                              inclusion=InclusionLevel.INCLUDED))
    return files
