#!/usr/bin/env bash
# `make test-versions`: the corners of the declared version ranges, each in its own
# environment, each running the version subset of the suite (VERSION_TESTS below).
#
#   oldest   Python 3.10, torch 2.4.0, Ray 2.40.0, and the lower bounds of numpy, pyarrow,
#            webdataset, accelerate and Lightning
#   newest   Python 3.11, torch 2.15.0, Ray 2.60.0, the rest as pip resolves it
#
# (The third corner, torch 2.13 CPU + Ray 2.60, is `make test`'s own environment.)
#
# Each corner starts as a user's environment would be: torch and Ray installed first. Then
# dpex goes in with `pip install -e .[test]`, and the script fails if that changed torch or
# Ray. The environments live in .venv-versions/<corner> and are reused while they hold the
# pinned versions.
#
# This machine's pip configuration pins torch to a local CPU build of 2.13; these
# environments need other versions, so pip runs here with no configuration file
# (PIP_CONFIG_FILE=/dev/null) and gets PyPI's torch builds (CUDA ones, several GB, which
# run on CPU too). The machine's configuration and .venv are never touched.
#
# Usage: scripts/test_versions.sh [corner ...]     (default: oldest newest)
#        scripts/test_versions.sh --stack corner ...   (only the torch and Ray each starts
#                                                     with, and dpex's requirements: the
#                                                     downloads, which .ci/run makes for the
#                                                     oldest beside the tiers)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1

# The subset: parity, recovery, resume, warm pool and elastic moves, joining a real
# `ray start` cluster (with and without token auth), user-code shipping, DDP sharing one
# Ray, the accelerate and Lightning integrations, the cache's object-store tier and the
# shared stream (named actors, object references passed between processes), and the cache's
# keys (they read each Python's bytecode).
VERSION_TESTS=(
    tests/test_parity.py
    tests/test_cluster_recovery.py
    tests/test_resume.py
    tests/test_pool.py
    tests/test_elastic.py
    tests/test_ray_start.py
    tests/test_user_code.py
    tests/test_ddp_auto.py
    tests/test_accelerate.py
    tests/test_lightning.py
    tests/test_compat.py
    tests/test_cache_ray.py
    tests/test_cache_keys.py
    tests/test_share.py
)

corner_python() {
    case "$1" in
        oldest) echo 3.10 ;;
        newest) echo 3.11 ;;
        *) echo "unknown corner '$1' (oldest, newest)" >&2; return 1 ;;
    esac
}

# What the user had before dpex: torch and Ray (and, for the oldest corner, numpy's bound).
corner_stack() {
    case "$1" in
        oldest) echo "torch==2.4.0 ray[default,data]==2.40.0 numpy==1.24.0" ;;
        newest) echo "torch==2.15.0 ray[default,data]==2.60.0" ;;
    esac
}

# The lower bounds of the other requirements that the oldest corner holds dpex to.
corner_constraints() {
    case "$1" in
        oldest) printf '%s\n' numpy==1.24.0 pyarrow==14.0.0 webdataset==0.2.86 \
                    accelerate==1.0.0 lightning==2.4.0 ;;
        newest) ;;
    esac
}

find_python() {  # python<version> on PATH, or pyenv's
    local version=$1 candidate
    for candidate in "python$version" "$HOME/.pyenv/versions/$version"*/bin/"python$version"; do
        if "$candidate" -c 'import venv, ssl' >/dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
    echo "no Python $version found (needed for this corner)" >&2
    return 1
}

versions_of() {  # "torch==X ray==Y" as installed in the environment
    "$1/bin/python" -m pip list --format=freeze 2>/dev/null |
        grep -iE '^(torch|ray)==' | sort | tr '\n' ' '
}

build_stack() {  # the user's environment before dpex: kept while it holds the pinned versions
    local corner=$1 env=.venv-versions/$1
    local stamp="$env/.stack" stack
    stack="$(corner_stack "$corner")"
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$stack" ]]; then
        rm -rf "$env"
        "$(find_python "$(corner_python "$corner")")" -m venv "$env" || return 1
        "$env/bin/python" -m pip install -q $stack || return 1
        echo "$stack" > "$stamp"
    fi
}

# dpex's requirements with its test extra, one a line, from pyproject.toml (dpex's own
# extras expanded), read by this machine's python3 (tomllib: Python 3.11 or later).
dpex_requirements() {
    python3 - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras, wanted, seen = project["optional-dependencies"], ["test"], set()
requirements = list(project["dependencies"])
while wanted:
    extra = wanted.pop()
    seen.add(extra)
    for requirement in extras[extra]:
        own = re.fullmatch(r"dpex\[([^\]]+)\]", requirement)
        if own:
            wanted += [e.strip() for e in own.group(1).split(",") if e.strip() not in seen]
        else:
            requirements.append(requirement)
print("\n".join(dict.fromkeys(requirements)))  # each once, in order
PY
}

# dpex's requirements alone, under the corner's constraints: `--stack` runs this beside
# the tiers, so that the install of dpex itself (below, which writes src/dpex.egg-info)
# finds them there. Like it, it must leave the user's torch and Ray as they are.
build_requirements() {
    local corner=$1 env=.venv-versions/$1 requirements
    corner_constraints "$corner" > "$env/constraints.txt"
    requirements="$(dpex_requirements)" || return 0  # an older python3: dpex's install does it
    install_keeping_stack "$corner" "dpex's requirements" -r <(echo "$requirements")
}

# `pip install ARGS` into the corner under its constraints; fails if that changed the
# user's torch or Ray (``what`` names the install in the message).
install_keeping_stack() {
    local corner=$1 what=$2 env=.venv-versions/$1 before after
    shift 2
    before="$(versions_of "$env")"
    "$env/bin/python" -m pip install -q -c "$env/constraints.txt" "$@" || return 1
    after="$(versions_of "$env")"
    if [[ "$before" != "$after" ]]; then
        echo "FAIL $corner: installing $what changed the user's stack: $before -> $after" >&2
        return 1
    fi
    echo "$corner: installing $what kept $after"
}

# Each step's failure returns at once: run_corner's caller tests its status (`||`), which
# turns `set -e` off inside it.
build_corner() {
    local corner=$1
    build_stack "$corner" || return 1
    build_requirements "$corner" || return 1
    install_keeping_stack "$corner" dpex -e ".[test]"
}

run_corner() {
    local corner=$1 env=.venv-versions/$1 start log
    build_corner "$corner" || return 1
    log=".venv-versions/$corner.log"
    start=$(date +%s)
    set +e
    "$env/bin/python" -m pytest -q -ra -p no:cacheprovider -n 2 --dist loadfile \
        --no-loadscope-reorder "${VERSION_TESTS[@]}" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    local minutes summary python
    minutes=$(awk "BEGIN { printf \"%.1f\", ($(date +%s) - $start) / 60 }")
    summary=$(grep -E '^=* ?[0-9]+ (passed|failed)' "$log" | tail -n 1 | tr -d '=' |
              sed -E 's/, [0-9]+ warnings?//; s/ in [0-9.]+s.*//; s/^ +//')
    python=$("$env/bin/python" -c 'import platform; print(platform.python_version())')
    RESULTS+=("| $corner | Python $python, $(versions_of "$env")| ${#VERSION_TESTS[@]} files | ${summary:-no summary} | $minutes |")
    return "$rc"
}

if [[ "${1:-}" == --stack ]]; then  # no dpex install here: it writes src/dpex.egg-info
    shift
    for corner in "$@"; do
        build_stack "$corner"
        build_requirements "$corner"
    done
    exit 0
fi

RESULTS=()
status=0
for corner in "${@:-oldest newest}"; do
    for c in $corner; do
        run_corner "$c" || status=1
    done
done
echo
echo "| corner | versions | tests | result | minutes |"
echo "| --- | --- | --- | --- | ---: |"
printf '%s\n' "${RESULTS[@]}"
exit "$status"
