"""A stand-in for a CARLA server process, for the launcher tests (run as CarlaUE4.sh).

Takes CARLA's command line, keeps a child process (as CarlaUE4.sh keeps the real binary),
listens on the -carla-rpc-port after FAKE_READY_AFTER seconds, and watches FAKE_CARLA_DIR:
``crash_<port>`` makes it exit with status 3, ``hang_<port>`` makes it stop answering
while staying alive. With FAKE_FAIL_START set it exits at once. Writes
``pids_<port>_<pid>`` (its pid and its child's) and ``args_<port>`` (its arguments).
"""

import os
import socket
import subprocess
import sys
import time


def main() -> int:
    args = sys.argv[1:]
    port = int(next(a.split("=", 1)[1] for a in args if a.startswith("-carla-rpc-port=")))
    control = os.environ["FAKE_CARLA_DIR"]
    with open(os.path.join(control, f"args_{port}"), "w") as f:
        f.write("\n".join(args))
    if os.environ.get("FAKE_FAIL_START"):
        return 4
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.path.join(control, f"pids_{port}_{os.getpid()}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(float(os.environ.get("FAKE_READY_AFTER", "0.3")))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(16)
    server.settimeout(0.05)
    while True:
        if os.path.exists(os.path.join(control, f"crash_{port}")):
            os.unlink(os.path.join(control, f"crash_{port}"))
            os._exit(3)
        if server is not None and os.path.exists(os.path.join(control, f"hang_{port}")):
            server.close()
            server = None
        if server is None:
            time.sleep(0.05)
            continue
        try:
            conn, _ = server.accept()
            conn.close()
        except socket.timeout:
            pass


if __name__ == "__main__":
    sys.exit(main())
