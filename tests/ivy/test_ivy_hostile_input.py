"""A hostile client's headers and names (issue 15): RELIABILITY case 33."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("value", ["-1", "0", "nan", "NaN", "inf", "-inf", "Infinity", "1e999", "soon"])
def test_bad_request_timeout_is_422_naming_the_header_and_range(fake, client, value) -> None:
    """RELIABILITY 33: a negative, zero, NaN or infinite X-Request-Timeout is a 422, never a 504."""
    r = client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": value})
    assert r.status_code == 422, (value, r.text)
    error = r.json()["error"]
    assert error["param"] == "x-request-timeout" and error["code"] == "invalid_parameter"
    assert "X-Request-Timeout" in error["message"] and "greater than 0" in error["message"]
    assert fake.calls == []

def test_good_request_timeouts_still_serve(client) -> None:
    for value in ("0.5", "30", "1e6", " 2 "):  # over the server's own timeout: the server's applies
        assert client.post("/v1/embeddings", json={"input": "a"}, headers={"X-Request-Timeout": value}).status_code == 200

