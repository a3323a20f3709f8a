"""Glue that makes the agent the rollout backend of a trainer; one subpackage per trainer.

- `easyr1`: EasyR1 (a verl fork): the rollout adapter, config schema, dataset and worker patches, entry point.
- `verl`: volcengine verl: the agent as a registered agent loop (`vrag_agent`), one episode per trajectory.
- `image_inputs`: the trainers' image-processor inputs, computed once per distinct page and shared by its samples.
"""
