"""Wiring of the components: in one process (the pipeline) and, later, as Ray actors."""
