"""Wiring of the components: in one process (pipeline.py, local_control.py) and as Ray actors
(ray_actors.py, ray_cluster.py, ray_control.py)."""
