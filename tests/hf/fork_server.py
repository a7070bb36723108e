"""A fork server for the test binaries' Python scripts (tests/common/python_runner.h).

A test binary runs dozens of Python scripts (the PyTorch reference twins, tests/hf/*.py, the
tokenizer references); each plain start pays 3 s to import torch and 7 s with transformers, most
of a Hugging Face test's time on 2 cores. This server imports them once, then forks a child per
request: the child starts from the state right after the imports (nothing of an earlier script
leaks into it), runs the script as `python SCRIPT ARGS...` would (`__main__`, `sys.argv`, the
script's folder first on `sys.path`), with stdout and stderr in the request's log, and its exit
status is the answer. The parent computes nothing, so no thread pool exists to be copied half-way
into a child.

Protocol on file descriptor FD (a socket the test binary holds): one JSON object a line,
{"script": PATH, "args": "ARGS as a shell would split them", "log": PATH}; the answer is the
exit status as one line (a negative number: the child died of that signal). The server exits when
the test binary closes its end, or dies.

usage: fork_server.py FD
"""

import ctypes
import importlib
import json
import os
import runpy
import shlex
import signal
import sys
import traceback

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


def die_with_parent():
    """SIGKILL when the parent dies (a test binary killed by ctest's timeout leaves nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_child(request, fd):
    """In the forked child: `python SCRIPT ARGS > LOG 2>&1`, and never return."""
    code = 1
    try:
        die_with_parent()
        os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        script = request["script"]
        sys.argv = [script] + shlex.split(request["args"])
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - reported as python would, exit 1
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def serve(fd):
    requests = os.fdopen(fd, "r", encoding="utf-8", closefd=False)
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(request, fd)
        _, status = os.waitpid(pid, 0)
        os.write(fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())


def main():
    die_with_parent()
    fd = int(sys.argv[1])
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    serve(fd)


if __name__ == "__main__":
    main()
