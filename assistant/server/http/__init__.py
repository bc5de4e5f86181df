"""The daemon's HTTP layer (Starlette): thin routes over the job layer, one module per API dialect.

``app`` (:class:`~assistant.server.http.app.HttpApp`: lifecycle, the scheduler, the routes every dialect
shares, errors; it mounts the dialects' routes), ``service`` (the ``JobService`` protocol the dialects'
routes are written against, so they never import the app), ``native`` (``/v1/diffu/*``, SSE step
events), ``openai`` (``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``), ``llama``
(llama.cpp's ``/infill``), ``streaming`` (the SSE response that cancels on disconnect, the health feed).
Requests become jobs in ``assistant.server.job_builder``, which knows nothing of HTTP.
"""
