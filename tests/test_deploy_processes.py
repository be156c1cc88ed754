import subprocess
import sys

import pytest

from specdeploy.deploy.processes import (
    ProcessIdentity,
    group_alive,
    identify,
    leader_alive,
    start_ticks,
    stop_group,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def sleeper():
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def test_identity_of_a_live_process(sleeper):
    identity = identify(sleeper.pid)
    assert identity.start_ticks == start_ticks(sleeper.pid) and identity.boot_id
    assert leader_alive(identity) and group_alive(identity)


def test_a_reused_pid_is_never_signalled(sleeper):
    stranger = identify(sleeper.pid).model_copy(update={"start_ticks": start_ticks(sleeper.pid) - 1})
    assert not leader_alive(stranger) and not group_alive(stranger)
    stop_group(stranger, grace_s=0.1)
    assert sleeper.poll() is None


def test_a_pid_from_before_a_reboot_is_never_signalled(sleeper):
    stranger = identify(sleeper.pid).model_copy(update={"boot_id": "another-boot"})
    stop_group(stranger, grace_s=0.1)
    assert sleeper.poll() is None


def test_workers_that_outlive_their_leader_are_stopped():
    # The leader exits at once and leaves a worker behind in its process group.
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    identity = identify(leader.pid)
    worker = int(leader.stdout.readline())
    leader.wait()
    assert not leader_alive(identity) and group_alive(identity)
    stop_group(identity, grace_s=2)
    assert not group_alive(identity)
    # Gone, or a zombie waiting for init to reap it: either way it no longer runs.
    assert not leader_alive(ProcessIdentity(pid=worker, start_ticks=None, boot_id=None))
