"""Running outside the cluster: a ``KubernetesProvider`` from a kubeconfig file.

The kubeconfig is read by ``kubernetes_asyncio``'s loader (contexts, embedded or file certificates, client
certificates, bearer tokens, exec credential plugins) into the client configuration the provider's
``ApiClient`` uses, so TLS and authentication are the client's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from fleetgate.providers.kubernetes import KubernetesProvider


async def from_kubeconfig(
    *,
    deployment: str,
    service: str,
    port_name: str | int | None = None,
    namespace: str | None = None,
    config_file: str | Path | None = None,
    context: str | None = None,
    **kwargs: Any,
) -> KubernetesProvider:
    """Build the provider from a kubeconfig (``config_file`` default: ``$KUBECONFIG`` or ``~/.kube/config``);
    the namespace defaults to the context's, else ``default``."""
    cfg = client.Configuration()
    loader = await config.load_kube_config(
        config_file=str(config_file) if config_file is not None else None,
        context=context,
        client_configuration=cfg,
        persist_config=False,
    )
    ctx_ns = ((loader.current_context or {}).get("context") or {}).get("namespace")
    return KubernetesProvider(
        configuration=cfg,
        namespace=namespace or ctx_ns or "default",
        deployment=deployment,
        service=service,
        port_name=port_name,
        **kwargs,
    )


async def connect(
    *,
    deployment: str,
    service: str,
    port_name: str | int | None = None,
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
) -> KubernetesProvider:
    """In a pod (``KUBERNETES_SERVICE_HOST`` set): the service account; elsewhere the kubeconfig
    (``$KUBECONFIG`` or ``~/.kube/config``)."""
    env = os.environ if env is None else env
    if env.get("KUBERNETES_SERVICE_HOST"):
        return KubernetesProvider.in_cluster(
            deployment=deployment, service=service, port_name=port_name, namespace=namespace, env=env
        )
    kubeconfig = env.get("KUBECONFIG")
    return await from_kubeconfig(
        deployment=deployment,
        service=service,
        port_name=port_name,
        namespace=namespace,
        config_file=kubeconfig.split(os.pathsep)[0] if kubeconfig else None,
    )
