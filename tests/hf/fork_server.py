"""A fork server for the tests' Python scripts (docs/DESIGN.md, "Tests and benchmarks").

The tests run hundreds of Python scripts (the PyTorch reference twins, tests/hf/*.py, the
tokenizer references, checks written inline in the e2e cases); each plain start pays 3 s to
import torch and 7 s with transformers, most of a Hugging Face test's time on 2 cores. This
server imports them once, then forks a child per script: the child starts from the state right
after the imports (nothing of an earlier script leaks into it) and runs the script as `python
ARGS...` would (`__main__`, `sys.argv`, the script's folder first on `sys.path`). The server
computes nothing itself, so no thread pool exists to be copied half-way into a child.

Two ways in:
  fork_server.py FD
      For one test binary (tests/common/python_runner.h), on the socket FD it holds: one JSON
      object a line, {"script": PATH, "args": "ARGS as a shell would split them", "log": PATH};
      the child writes stdout and stderr to the log, and the answer is its exit status as one
      line (negative: killed by that signal). Ends when the binary closes its end, or dies.
  fork_server.py --listen SOCKET
      For the e2e scripts, one server per ctest run (the `python_server` fixture,
      tests/CMakeLists.txt): a daemon on a UNIX socket that tests/hf/python_client.py, the
      e2e tests' TRAINER_PYTHON, talks to. The client sends its arguments, working directory and
      environment with its stdin, stdout and stderr; a handler forked per connection forks the
      script's child with those, answers the exit status, and kills the child if the client goes
      away (a test's timeout). A client whose environment differs from the server's in what the
      imports read (HF_*, TORCH*, OMP_*, ...) is told to run a Python of its own. Every
      child runs offline (HF_HUB_OFFLINE=1), as the tests do. Ends on
      `python_client.py --stop` (or a new server on the same socket), or after an hour without
      a client.
"""

import builtins
import ctypes
import importlib
import json
import os
import runpy
import select
import shlex
import signal
import socket
import sys
import time
import traceback

import python_client  # beside this file: the stop request, shared with the client

# What the scripts import, heaviest first; a module that is missing is the script's to report.
PRELOAD = [
    "torch",
    "numpy",
    "safetensors.torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.mistral.modeling_mistral",
    "transformers.models.gemma3.modeling_gemma3",
    "transformers.tokenization_utils_fast",
    "peft",
    "tokenizers",
    "tiktoken",
]

# Environment variables that what PRELOAD imports reads when it is imported: a client whose values
# differ runs a Python of its own.
IMPORT_ENV = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "OMP_",
              "MKL_", "PYTHON", "LD_", "CUDA", "TIKTOKEN", "SAFETENSORS", "PEFT", "NUMPY")

# The tests run offline (nothing is downloaded): so do the imports, and every child.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

IDLE_S = 3600

# Those variables as the server started, before the imports (torch sets some of them).
START_ENV = {}


def preload():
    os.environ.update(OFFLINE)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def die_with_parent():
    """SIGKILL when the parent dies (a test binary killed by ctest's timeout leaves nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_code(code, name):
    exec(compile(code, name, "exec"), {"__name__": "__main__", "__builtins__": builtins})


def run_python(argv):
    """`python ARGV...` in this process (a script PATH, `-c CODE` or `-` for stdin): its exit
    status."""
    try:
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[0] = ""
            run_code(argv[1], "<string>")
        elif argv[0] == "-":
            sys.argv = ["-"] + argv[1:]
            sys.path[0] = ""
            run_code(sys.stdin.read(), "<stdin>")
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - reported as python would, exit 1
        traceback.print_exc()
        return 1


def child_exit(code):
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


# --- one test binary, on a socket it holds ---------------------------------------------------


def serve_binary(fd):
    requests = os.fdopen(fd, "r", encoding="utf-8", closefd=False)
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                die_with_parent()
                os.close(fd)
                log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(log)
                code = run_python([request["script"]] + shlex.split(request["args"]))
            finally:
                child_exit(code)
        _, status = os.waitpid(pid, 0)
        os.write(fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())


# --- the e2e scripts' clients, on a UNIX socket ------------------------------------------------


def import_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV) and k not in OFFLINE}


def receive(conn):
    """The client's request (a dict) and its stdin, stdout and stderr."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("the client went away")
        data += more
    return json.loads(data), fds


def handle(conn):
    """In a handler forked per connection: run the client's script in a child of its own."""
    try:
        request, fds = receive(conn)
        ours = len(fds) == 3 and import_env(request["env"]) == START_ENV
    except (OSError, ValueError, KeyError):
        ours = False
    if not ours:  # nothing ran: the client runs a Python of its own
        conn.sendall(b"fallback\n")
        return
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            os.environ.update(OFFLINE)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = run_python(request["argv"])
        finally:
            child_exit(code)
    for fd in fds:
        os.close(fd)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            return
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1):  # the client is gone: so is its script
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return


def stop_server(path):
    """Stops a server that listens on `path` (an earlier run's), if one does, and waits until it
    has stopped listening."""
    for _ in range(100):
        if not python_client.send_stop(path):
            return
        time.sleep(0.1)


def listen(path):
    stop_server(path)
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)  # the clients that come during the imports wait for them
    return listener


def serve_socket(listener, path):
    ino = os.stat(path).st_ino
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are reaped by the kernel
    last = time.monotonic()
    while time.monotonic() - last < IDLE_S:
        readable, _, _ = select.select([listener], [], [], 60)
        if not readable:
            continue
        conn, _ = listener.accept()
        last = time.monotonic()
        if conn.recv(5, socket.MSG_PEEK) == b"stop\n":
            conn.close()
            break
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the handler waits for its child
            try:
                handle(conn)
            except BaseException:  # noqa: BLE001 - the client falls back on a broken answer
                traceback.print_exc()
            os._exit(0)
        conn.close()
    listener.close()
    try:
        if os.stat(path).st_ino == ino:  # not a newer server's
            os.unlink(path)
    except OSError:
        pass


def daemonize(log):
    """Detached from ctest's test (which must end, and whose output pipes must close)."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)


def main():
    if sys.argv[1] == "--listen":
        path = os.path.abspath(sys.argv[2])
        START_ENV.update(import_env(os.environ))
        listener = listen(path)
        daemonize(path + ".log")
        preload()
        serve_socket(listener, path)
    else:
        die_with_parent()
        preload()
        serve_binary(int(sys.argv[1]))


if __name__ == "__main__":
    main()
