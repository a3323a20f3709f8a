"""Glue that makes the agent the rollout backend of a trainer; one subpackage per trainer.

- `easyr1`: EasyR1 (a verl fork): the rollout adapter, config schema, dataset and worker patches, entry point.
"""
