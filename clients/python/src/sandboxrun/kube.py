"""The caller's own Kubernetes credentials: a kubeconfig (``KUBECONFIG``, ``~/.kube/config``, or
the one named) or, inside a pod, its ServiceAccount. Nothing else is ever used."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _kubeconfig_exists(path: str | None) -> bool:
    if path:
        return True
    env = os.environ.get("KUBECONFIG")
    if env:
        return any(Path(p).expanduser().exists() for p in env.split(os.pathsep) if p)
    return Path("~/.kube/config").expanduser().exists()


def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[client.ApiClient, str]:
    """An API client and the namespace to use by default (the context's, as kubectl does; in a
    pod, the pod's own; else ``default``)."""
    if _kubeconfig_exists(kubeconfig) or context:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
            active = next(c for c in contexts if c["name"] == context)
        namespace = (active.get("context") or {}).get("namespace") or "default"
        return api, namespace
    config.load_incluster_config()
    namespace = _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else "default"
    return client.ApiClient(), namespace
