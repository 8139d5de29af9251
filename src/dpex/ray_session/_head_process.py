"""The helper process of ``embedded.py`` (its NOTE): start the embedded Ray head,
print its address, and shut it down when stdin closes or the trainer is gone (NOTE
[ dpex How Each Process Ends ], process_ends.py).

Run as a plain script, not as part of the ``dpex`` package, so that it imports Ray and
not torch: ``python _head_process.py NICENESS TEMP_DIR [OWN_TOKEN]``: Ray's temporary folder
(inside the session's private folder), and the token file made for this session alone,
removed once Ray is down (NOTE [ dpex Embedded Ray's Private Session ]).
"""

import importlib.util
import os
import signal
import sys
import threading


def _load(name):
    """A module of dpex's, loaded alone (``import dpex`` would import torch)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/dpex
    path = os.path.join(package, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_dpex_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    trainer_pid = os.getppid()
    # First of all, before Ray's import: the lowest priority for what this starts (NOTE
    # [ dpex Embedded Head Priority ], head_priority.py), until the trainer's word or LOW_S.
    priority = _load("ray_session/head_priority")
    group = priority.SessionPriority()
    if group.lowered:
        timer = threading.Timer(priority.LOW_S, group.hear, args=(priority.FULL_PRIORITY,))
        timer.daemon = True
        timer.start()
    closed = threading.Event()

    def hear_the_trainer() -> None:  # its words from the start, ray.init or not; then EOF
        for line in sys.stdin.buffer:
            group.hear(line.decode(errors="replace").strip())
        closed.set()
        group.wake.set()

    threading.Thread(target=hear_the_trainer, daemon=True, name="dpex-trainer-words").start()
    process_ends = _load("process_ends")
    stopping = threading.Lock()
    session: list[str] = []  # the node's session directory, once it has one
    temp_dir, own_token = sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""

    def remove_own_token() -> None:
        if own_token:
            try:
                os.unlink(own_token)
            except FileNotFoundError:
                pass

    def stop_ray() -> None:  # the trainer closed stdin: a graceful stop
        with stopping:
            process_ends.shutdown_ray(compat.started_node_pids(), *session)
            remove_own_token()

    def trainer_gone() -> None:  # however far the head got: end all of it now
        if stopping.acquire(blocking=False):  # else the graceful stop runs: let it end
            process_ends.kill_descendants()
            for session_dir in session:
                process_ends.kill_naming(session_dir)
            remove_own_token()
        else:
            stopping.acquire()

    # Ctrl-C is the trainer's to act on; the trainer's death ends this process, with Ray.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    process_ends.watch_parent(trainer_pid, on_orphaned=trainer_gone)
    # A loop that ends within START_AFTER_S never pays Ray's start, nor its import.
    group.wait_to_start()
    if closed.is_set():  # the trainer is done before it needed Ray: start none of it
        remove_own_token()
        return
    compat = _load("compat")
    try:
        context = compat.start_embedded_ray(int(sys.argv[1]), priority.WORKER_REGISTER_S,
                                            _temp_dir=temp_dir)
    except BaseException:  # e.g. the raylet did not register in time: leave none of it
        process_ends.kill_descendants()  # (the token stays for a retry: the trainer's)
        raise
    session.extend(filter(None, [context.address_info.get("session_dir")]))
    port = context.address_info["gcs_address"].rsplit(":", 1)[1]
    print(f"127.0.0.1:{port}", flush=True)
    closed.wait()  # until the trainer closes stdin, or dies
    stop_ray()


if __name__ == "__main__":
    main()
