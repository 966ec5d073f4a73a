"""mmjudge on Ray (the ray extra): judge-serve's replicas on Ray Serve (mmjudge/ray/serve.py)."""
