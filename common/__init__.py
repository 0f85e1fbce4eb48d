"""What two or more GoSched components share: the model, message types, cluster arrays, the store.

Nothing here imports a component package.
"""
