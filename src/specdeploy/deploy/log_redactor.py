"""Run a server with its output written to a log file with the API key replaced by ***.

`python -m specdeploy.deploy.log_redactor LOG -- ARGV...`: SGLang logs its whole ServerArgs, `api_key`
included, at start-up. This process leads the server's process group, so stopping the group stops both; it
ignores SIGTERM itself so that it writes the server's last lines, and exits with the server's status.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from specdeploy.api_key import redact


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m specdeploy.deploy.log_redactor LOG -- ARGV...")
    log_path, command = argv[0], argv[2:]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the server; EOF ends this
    # The server gets SIGTERM's default action back (ignored dispositions are inherited across exec).
    server = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    )
    assert server.stdout is not None
    with open(log_path, "ab") as log:
        for line in server.stdout:
            log.write(redact(line.decode(errors="replace")).encode())
            log.flush()
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
