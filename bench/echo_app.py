"""The baseline for bench_http.py: a raw ASGI app that parses the AdmissionReview with orjson and
answers `allowed: true` with its uid, served by the same uvicorn + TLS setup as `topoguard serve`.

    .venv/bin/python bench/echo_app.py --port 9443 --tls-cert tls.crt --tls-key tls.key

It does the minimum any webhook must do (read the body, parse JSON, write JSON), so the ratio
topoguard / echo isolates what the decision and the framework cost.
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
import uvicorn

from app.tls import CertificateFiles


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    if scope["path"] == "/readyz":
        body = b'{"ready":true}'
    else:
        review = orjson.loads(b"".join(chunks))
        body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": review["request"]["uid"], "allowed": True}})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    opts = parser.parse_args()
    # Same server knobs as app/commands/serve.py, so only the application differs.
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_config=None, access_log=False,
                            server_header=False, date_header=False, lifespan="on", timeout_keep_alive=60)
    config.load()
    config.ssl = CertificateFiles(opts.tls_cert, opts.tls_key).context
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
