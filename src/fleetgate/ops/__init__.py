"""Operations: per-tenant SLO tracking, Prometheus SLO gauges, the status JSON and page, structured logs."""
