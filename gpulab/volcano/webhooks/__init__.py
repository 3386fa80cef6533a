"""vc-webhook-manager's admission (volcano-sh/volcano v1.15.1 ``pkg/webhooks/admission``)."""
