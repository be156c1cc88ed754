"""`--format k8s`: a LeaderWorkerSet (one pod per node) and a Service in front of the leader."""

from __future__ import annotations

import yaml

from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.render.container import (
    DIST_INIT_PORT,
    HF_CACHE_IN_CONTAINER,
    container_shell_command,
    gated_models,
    resource_name,
    startup_seconds,
)

HF_TOKEN_SECRET = "hf-token"  # kubectl create secret generic hf-token --from-literal=token=$HF_TOKEN
API_KEY_SECRET = (
    "specdeploy-api-key"  # kubectl create secret generic specdeploy-api-key --from-literal=key=...
)
HF_CACHE_CLAIM = "hf-cache"  # a PersistentVolumeClaim large enough for the weights, created beforehand
SHM_LIMIT = "32Gi"
# LeaderWorkerSet injects these into every pod of a group.
MULTI_NODE_ARGS = f" --node-rank $LWS_WORKER_INDEX --dist-init-addr $LWS_LEADER_ADDRESS:{DIST_INIT_PORT}"


def _container(plan: LaunchPlan, leader: bool) -> dict:
    extra = MULTI_NODE_ARGS if plan.gpus.nnodes > 1 else ""
    env = [{"name": key, "value": value} for key, value in sorted(plan.env.items())]
    token_ref = {"name": HF_TOKEN_SECRET, "key": "token", "optional": not gated_models(plan)}
    env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": token_ref}})
    if plan.api_key_env is not None:
        key_ref = {"name": API_KEY_SECRET, "key": "key"}
        env.append({"name": plan.api_key_env, "valueFrom": {"secretKeyRef": key_ref}})
    limits: dict = {"nvidia.com/gpu": plan.gpus.count}
    if plan.gpus.rdma_resource is not None:
        limits[plan.gpus.rdma_resource] = 1
    container = {
        "name": "sglang",
        "image": plan.engine.image,
        "command": ["bash", "-c", container_shell_command(plan, extra)],
        "env": env,
        "resources": {"limits": limits},
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "hf-cache", "mountPath": HF_CACHE_IN_CONTAINER},
        ],
    }
    if plan.gpus.nnodes > 1:
        # RDMA registers (pins) host memory: the container needs IPC_LOCK for NCCL's InfiniBand transport.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    if leader:
        container["ports"] = [{"containerPort": plan.port, "name": "http"}]
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": plan.port},
            "initialDelaySeconds": 60,
            "periodSeconds": 15,
            "failureThreshold": startup_seconds(plan) // 15,
        }
    return container


def _pod(plan: LaunchPlan, leader: bool) -> dict:
    spec: dict = {}
    if plan.gpus.nnodes > 1:
        # NCCL reaches the other node through the host's interfaces named in env (NCCL_SOCKET_IFNAME), not
        # through the pod network's overlay.
        spec |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    spec |= {
        "containers": [_container(plan, leader)],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_LIMIT}},
            {"name": "hf-cache", "persistentVolumeClaim": {"claimName": HF_CACHE_CLAIM}},
        ],
    }
    return {"metadata": {"labels": {"role": "leader" if leader else "worker"}}, "spec": spec}


def render_k8s(plan: LaunchPlan) -> str:
    name = resource_name(plan)
    template: dict = {"size": plan.gpus.nnodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    template["leaderTemplate"] = _pod(plan, leader=True)
    if plan.gpus.nnodes > 1:
        template["workerTemplate"] = _pod(plan, leader=False)
    else:
        template["workerTemplate"] = template.pop("leaderTemplate")
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "leaderWorkerTemplate": template},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-leader"},
        "spec": {
            "selector": {"leaderworkerset.sigs.k8s.io/name": name, "role": "leader"},
            "ports": [{"name": "http", "port": plan.port, "targetPort": plan.port}],
        },
    }
    needs = f"a Secret `{HF_TOKEN_SECRET}` (key `token`)"
    if plan.api_key_env is not None:
        needs += f", a Secret `{API_KEY_SECRET}` (key `key`: the server's API key)"
    header = (
        f"# {plan.summary}\n"
        f"# Needs the LeaderWorkerSet controller, {needs} and a PersistentVolumeClaim `{HF_CACHE_CLAIM}` for "
        "the weights.\n"
    )
    if plan.gpus.rdma_resource is not None:
        header += (
            f"# Pods use the host network and request `{plan.gpus.rdma_resource}` from the RDMA device plugin "
            "(NVIDIA network operator); the NCCL variables below name the profile's fabric.\n"
        )
    header += "".join(f"# warning: {warning}\n" for warning in plan.warnings)
    if plan.engine.build is not None:
        header += (
            f"# {plan.engine.image} is built here, not pulled: `specdeploy image build`, then tag and push it to "
            "a registry the cluster pulls from and change `image` below.\n"
        )
    return header + yaml.safe_dump_all([lws, service], sort_keys=False, width=10_000)
