"""Admission: tenants and API keys, rate limits and reservations in MU, the priority queue, admin views.

The decisions are pure (``fleetgate.core.admission``); ``service.AdmissionService`` is the async shell.
"""
