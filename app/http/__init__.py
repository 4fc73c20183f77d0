"""The HTTP layer: the FastAPI app and routes (app.py, routes.py) and the pure admission pipeline.

`admission` (parse → answer) and `responses` (outcome → AdmissionReview) import no web framework,
so `topoguard review` uses exactly the server's code path without loading FastAPI. Keep this
module free of imports for the same reason.
"""
