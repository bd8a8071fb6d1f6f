"""The stack's one typed config (`StackConfig`), split by section; import it from here.

- `stack`: `StackConfig`, the tier defaults and loading (`load_stack_config`, `from_pulumi`);
- `sections`: network, storage, the small node, schedule, job, monitoring, cost, image;
- `eks`: the EKS cluster and the online endpoint.
"""

from infra.config.eks import EksConfig, ServeSection
from infra.config.sections import (
    NAMESPACE,
    NIGHTLY_LEASE_WAIT_S,
    SECRET_KEYS,
    BatchApiSection,
    CostConfig,
    ImageConfig,
    InterfaceEndpoint,
    JobSection,
    MonitoringConfig,
    NetworkConfig,
    ScheduleConfig,
    SmallConfig,
    StackConfigError,
    StorageConfig,
    Tier,
)
from infra.config.stack import (
    TIER_DEFAULTS,
    StackConfig,
    decode_pulumi_values,
    from_pulumi,
    load_stack_config,
)

__all__ = [
    "NAMESPACE",
    "NIGHTLY_LEASE_WAIT_S",
    "SECRET_KEYS",
    "TIER_DEFAULTS",
    "BatchApiSection",
    "CostConfig",
    "EksConfig",
    "ImageConfig",
    "InterfaceEndpoint",
    "JobSection",
    "MonitoringConfig",
    "NetworkConfig",
    "ScheduleConfig",
    "ServeSection",
    "SmallConfig",
    "StackConfig",
    "StackConfigError",
    "StorageConfig",
    "Tier",
    "decode_pulumi_values",
    "from_pulumi",
    "load_stack_config",
]
