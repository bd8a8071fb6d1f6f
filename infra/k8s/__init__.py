"""Kubernetes manifests as pure, typed renderers: plain dicts in, plain dicts out.

Nothing here talks to a cluster or to Pulumi, so the Pulumi components, the nightly submitter and the tests
all render the same objects from the same typed inputs.
"""
