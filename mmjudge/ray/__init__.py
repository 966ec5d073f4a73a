"""mmjudge on a Ray cluster (the optional `ray` extra: `pip install 'mmjudge[ray]'`), a thin layer over the engine
judge-score and judge-serve run, never a scheduler of its own: Ray places the actors and replicas, retries their tasks
and restarts them.

- `mmjudge.ray.data`: batch judging on Ray Data, a stateful callable class for `Dataset.map_batches` (one judge
  loaded per actor) and what `judge-score --ray ADDRESS` runs.
- `mmjudge.ray.serve`: judge-serve's replicas on Ray Serve behind one address, with a router that keeps a question's
  group on one replica (`judge-serve --replicas N`).

Nothing here imports ray until it is used, so that `import mmjudge` works without the extra.
"""
