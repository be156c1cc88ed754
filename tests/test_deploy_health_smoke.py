import subprocess
import sys
import time

import pytest
from deploy_helpers import FAKE_SERVER, free_port

from specdeploy.deploy.health import ServerStartError, wait_for_health
from specdeploy.deploy.launchers import tail_file
from specdeploy.deploy.smoke import run_smoke_test


@pytest.fixture
def start_fake_server(tmp_path):
    processes = []

    def start(*flags):
        port = free_port()
        log = tmp_path / f"server-{port}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, str(FAKE_SERVER), "--port", str(port), *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        processes.append(process)
        return process, f"http://127.0.0.1:{port}", log

    yield start
    for process in processes:
        process.kill()
        process.wait()


def test_becomes_healthy_after_a_delay(start_fake_server):
    process, url, log = start_fake_server("--healthy-after", "1.0")
    began = time.monotonic()
    waited = wait_for_health(url, lambda: process.poll() is None, lambda n: tail_file(log, n), 30, poll_s=0.1)
    assert waited >= 1.0 and time.monotonic() - began < 15


def health_requests(log) -> list[tuple[str, int]]:
    """(route, status) of every health probe the fake server answered, from its access log lines
    (`"GET /health HTTP/1.1" 503 -`)."""
    found = []
    for line in log.read_text().splitlines():
        if line.startswith('"GET /health'):
            request, status = line.rsplit('"', 1)
            found.append((request.split()[1], int(status.split()[0])))
    return found


def test_falls_back_to_health_without_health_generate(start_fake_server):
    # No /health_generate (404), and /health answers 503 for its first 0.3 s.
    process, url, log = start_fake_server("--no-health-generate", "--healthy-after", "0.3")
    waited = wait_for_health(url, lambda: process.poll() is None, lambda n: tail_file(log, n), 30, poll_s=0.1)
    probes = health_requests(log)
    # /health_generate is asked once: its 404 is neither healthy nor a reason to ask it again
    assert probes[0] == ("/health_generate", 404)
    assert [route for route, _ in probes[1:]] == ["/health"] * (len(probes) - 1)
    # the waiter polled /health through its 503s and returned on its first 200, not before
    assert [status for _, status in probes[1:]] == [503] * (len(probes) - 2) + [200]
    assert len(probes) >= 2 and waited > 0


def test_server_that_dies_shows_its_log(start_fake_server):
    process, url, log = start_fake_server("--die-after", "0.2")
    with pytest.raises(ServerStartError) as error:
        wait_for_health(url, lambda: process.poll() is None, lambda n: tail_file(log, n), 30, poll_s=0.1)
    message = str(error.value)
    assert message.startswith("the server exited during startup")
    assert "CUDA out of memory while loading the drafter" in message


def test_timeout_shows_its_log(start_fake_server):
    process, url, log = start_fake_server("--healthy-after", "60")
    with pytest.raises(ServerStartError, match=r"within 1 s[\s\S]*loading weights"):
        wait_for_health(url, lambda: process.poll() is None, lambda n: tail_file(log, n), 1, poll_s=0.1)


def test_smoke_reports_tau(start_fake_server):
    process, url, log = start_fake_server("--tau", "4")
    wait_for_health(url, lambda: process.poll() is None, lambda n: tail_file(log, n), 30, poll_s=0.1)
    report = run_smoke_test(url, speculative=True, max_new_tokens=16)
    assert report.tau == pytest.approx(4.0)
    assert len(report.results) == 3 and all(r.completion_tokens == 16 for r in report.results)
    assert report.warnings == []


def test_smoke_warns_on_implausible_tau(start_fake_server):
    process, url, log = start_fake_server("--tau", "1.1")
    wait_for_health(url, lambda: process.poll() is None, lambda n: tail_file(log, n), 30, poll_s=0.1)
    report = run_smoke_test(url, speculative=True, max_new_tokens=16)
    assert report.tau < 1.3
    assert any("drafter probably does not match the target" in w for w in report.warnings)
    # The same numbers are no concern without speculation.
    assert not run_smoke_test(url, speculative=False, max_new_tokens=16).warnings
