"""A seeded fuzz of the daemon's HTTP API: malformed requests on every route and field get a 4xx, never a 5xx.

Each request takes a valid body for its route and breaks one or two fields (or the body itself) with a
value drawn from the shapes that broke daemons before: huge integers, lone surrogates, deep nesting,
wrong types, out-of-range numbers, very long strings. Afterwards the daemon must still answer a normal
request exactly as before. ``scripts/fuzz_daemon.py`` runs the same generator for thousands of requests.
"""

from __future__ import annotations

import httpx

from tests.assistant.fuzz import VALID, malformed_requests


def test_malformed_requests_get_4xx_and_the_daemon_keeps_answering(fake_daemon):
    normal = {"prompt": "def add(a, b):", "max_new_tokens": 8, "stream": False}
    with httpx.Client(base_url=fake_daemon.url, headers=fake_daemon.headers, timeout=30) as http:
        before = http.post("/v1/diffu/generate", json=normal).json()["text"]
        statuses: dict[int, int] = {}
        routes = set()
        for path, body in malformed_requests(seed=1234, count=300):
            response = http.post(path, content=body, headers={"content-type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            # A mutation can happen to stay valid (``stop: null``); it must then be answered normally.
            assert response.status_code in (200, 400, 404, 413, 422), (path, body[:300], response.text[:300])
            assert "Traceback" not in response.text
            if response.status_code != 200:
                assert response.json()["error"]["message"]  # a JSON error body that says what is wrong
            routes.add(path)
        assert routes == set(VALID)
        after = http.post("/v1/diffu/generate", json=normal).json()["text"]
    assert after == before
    assert sum(statuses.values()) == 300 and statuses.get(400, 0) >= 240, statuses
