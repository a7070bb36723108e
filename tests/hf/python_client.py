#!/usr/bin/python3 -S
"""`python ARGS...` through the tests' fork server (tests/hf/fork_server.py --listen), which has
torch and transformers imported already: the e2e scripts' TRAINER_PYTHON (tests/CMakeLists.txt).

It sends its arguments, working directory and environment, with its stdin, stdout and stderr,
over TRAINER_PYTHON_SERVER (a UNIX socket), and exits with the script's status. Where no server
answers, where the server says so (an environment that changes what the imports read), or for
arguments other than a script, `-c CODE` or `-`, it runs TRAINER_REAL_PYTHON itself: the tests
behave the same without the server, only slower.

  python_client.py --stop     stops the server (the fixture's cleanup)
This file runs on the system's Python without site packages (-S), so it starts in milliseconds.
"""

import json
import os
import socket
import sys


def fallback(argv):
    real = os.environ["TRAINER_REAL_PYTHON"]
    os.execv(real, [real] + argv)


def answer(conn):
    data = b""
    while not data.endswith(b"\n"):
        more = conn.recv(64)
        if not more:
            return None
        data += more
    return data.decode().strip()


def send_stop(path):
    """Asks the server on `path` to stop; False where none listens there. The server
    (fork_server.py) calls it too, to stop an earlier run's."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(b"stop\n")
    except OSError:
        return False
    return True


def main():
    argv = sys.argv[1:]
    path = os.environ.get("TRAINER_PYTHON_SERVER", "")
    if argv == ["--stop"]:
        send_stop(path)
        return 0
    script = argv and (argv[0] in ("-", "-c") or not argv[0].startswith("-"))
    if not path or not script or (argv[0] == "-c" and len(argv) < 2):
        fallback(argv)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
        socket.send_fds(conn, [request.encode() + b"\n"], [0, 1, 2])
    except OSError:  # no server: nothing ran
        conn.close()
        fallback(argv)
    try:
        status = answer(conn)
    except OSError:
        status = None
    if status == "fallback":
        conn.close()
        fallback(argv)
    if status is None:  # the script may have run in part: not again
        print(f"[python_client] the fork server on {path} went away while running {argv}",
              file=sys.stderr)
        return 1
    code = int(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
