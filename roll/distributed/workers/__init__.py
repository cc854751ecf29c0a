"""One module per Ray role, each a plain class with one narrow interface (the pipeline wraps it
with `ray.remote`): `actor.ActorWorker`, `critic.CriticWorker`, `reference.ReferenceWorker`,
`inference.InferenceWorker`. `common` holds the few pieces the training roles share.
"""
