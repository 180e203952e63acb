"""The README's EKS steps, run the way a user runs them, on a fresh real control plane.

The fenced `sh` block under "Install on EKS with Helm" in the root README is read from the file,
and each of its command lines is run by bash from the repository root, in order, with the
control plane's own kubectl and helm first on PATH. The comment lines after the last command are
what the README says that command prints; it must print that (the AGE column aside).

Only what cannot exist here is substituted: the cluster is a fresh control plane (the suite's
kube-apiserver, controller-manager and scheduler) whose nodes are kwok's, shaped like
p5en.48xlarge (GPUs, EFA devices, hugepages, the instance-type and network-layer labels); kwok
pods run no process, so the operator the chart installs runs as a local process with the
chart's ServiceAccount token; `HF_TOKEN` is a placeholder. A step that fails as written (a
namespace nothing creates) fails here with the output a user would see.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest
from cluster import Cluster, missing_binaries
from kube import wait_until
from operator_process import OperatorProcess
from suite import RELEASE_NAMESPACE, ROOT, SERVICE_ACCOUNT

pytestmark = pytest.mark.cluster

SECTION = "## Install on EKS with Helm"


def eks_steps(readme: str) -> tuple[list[str], list[str]]:
    """The block's commands, and the lines the README says its last command prints."""
    section = readme.split(SECTION, 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found, f"no sh block under {SECTION!r}"
    commands: list[str] = []
    printed: list[str] = []
    for line in found.group(1).splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            printed.append(line.removeprefix("#").strip())
        else:
            commands.append(line)
            printed = []  # comments before a command explain it; only the last ones are output
    return commands, printed


def columns(lines: list[str]) -> list[list[str]]:
    """Each line's columns without the last (AGE: minutes in the README, seconds here)."""
    return [line.split()[:-1] for line in lines if line.strip()]


@pytest.fixture(scope="module")
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of its own: the suite's shared one already has the chart installed."""
    missing = missing_binaries()
    if missing:
        message = f"control plane binaries missing ({', '.join(missing)}): run `make tools`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with Cluster(tmp_path_factory.mktemp("eks")) as running:
        yield running


def run_step(cluster: Cluster, command: str) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env(), "HF_TOKEN": "hf_placeholder"}
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_readme_eks_steps_run_as_written_and_print_what_it_shows(
    fresh_cluster: Cluster,
) -> None:
    commands, printed = eks_steps((ROOT / "README.md").read_text())
    *steps, last = commands
    assert f"-n {RELEASE_NAMESPACE}" in steps[0] and steps[0].startswith("helm install")
    assert printed, "the README shows no output for its last command"
    for step in steps:
        done = run_step(fresh_cluster, step)
        assert done.returncode == 0, f"{step}\nfailed as written:\n{done.stdout}{done.stderr}"
    kubeconfig = fresh_cluster.service_account_kubeconfig(
        RELEASE_NAMESPACE, SERVICE_ACCOUNT, fresh_cluster.workdir / "operator.kubeconfig"
    )
    operator = OperatorProcess(kubeconfig, fresh_cluster.workdir / "operator.log")
    operator.start()
    try:
        last_output: list[str] = []

        def shows_the_readme() -> bool:
            done = run_step(fresh_cluster, last)
            last_output[:] = done.stdout.splitlines()
            return done.returncode == 0 and columns(last_output) == columns(printed)

        try:
            wait_until(f"`{last}` to print what the README shows", shows_the_readme, timeout=240)
        except Exception as exc:
            shown = "\n".join(last_output)
            raise AssertionError(f"{exc}\nit printed:\n{shown}\nthe README:\n{printed}") from exc
    finally:
        operator.stop()
