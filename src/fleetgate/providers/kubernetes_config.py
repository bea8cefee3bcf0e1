"""Running outside the cluster: a ``KubernetesProvider`` from a kubeconfig file.

The kubeconfig is read by ``kubernetes_asyncio``'s loader (the maintained client's: contexts, embedded or
file certificates, client certificates, bearer tokens, exec credential plugins), an optional dependency
(``pip install 'fleetgate[kubernetes]'``). The requests themselves still go through the provider's own
aiohttp calls (docs/real-fleets.md says why and what is left). The token is taken once, when loading: an exec
plugin's short-lived token needs the provider built again when it expires.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

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
    try:
        from kubernetes_asyncio import client, config  # the optional extra, imported only when used
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("reading a kubeconfig needs `pip install 'fleetgate[kubernetes]'`") from exc
    cfg = client.Configuration()
    loader = await config.load_kube_config(
        config_file=str(config_file) if config_file is not None else None,
        context=context,
        client_configuration=cfg,
        persist_config=False,
    )
    ctx_ns = ((loader.current_context or {}).get("context") or {}).get("namespace")
    token = await cfg.get_api_key_with_prefix("BearerToken")
    ssl_ctx: ssl.SSLContext | bool | None = None
    if str(cfg.host).startswith("https"):
        ssl_ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else None
        if cfg.cert_file:
            ssl_ctx = ssl_ctx or ssl.create_default_context()
            ssl_ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            ssl_ctx = False
    return KubernetesProvider(
        api_base=str(cfg.host),
        namespace=namespace or ctx_ns or "default",
        deployment=deployment,
        service=service,
        port_name=port_name,
        token=token.removeprefix("Bearer ").strip() if token else None,
        ssl_context=ssl_ctx,
        **kwargs,
    )
