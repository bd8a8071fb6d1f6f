"""The repo's price table (`prices.json`): typed, validated, with its date and source."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_TABLE = Path(__file__).with_name("prices.json")


class PriceTableError(ValueError):
    """A price the estimate needs is not in the table; the message names it and how to add it."""


class InstancePrice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    vcpus: int = Field(gt=0, description="vCPUs: what EC2 Service Quotas count")
    gpus: int = Field(ge=0, description="NVIDIA GPUs per instance")
    on_demand_hourly: float = Field(gt=0, description="On-demand Linux price, USD per instance-hour")
    spot_hourly: float = Field(gt=0, description="Typical Spot price, USD per instance-hour (varies by AZ)")
    # A price entered apart from the rest of its region (a price cut, a type added later) carries its own date and
    # source; the others take their region's or the table's (`PriceTable.dated_instance`).
    as_of: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$", description="Date this row's prices were seen")
    source: str | None = Field(None, min_length=20, description="Where this row's prices come from and how")

    @model_validator(mode="after")
    def _dated_with_source(self) -> InstancePrice:
        if (self.as_of is None) != (self.source is None):
            raise ValueError("as_of and source go together: a price of its own needs both its date and its source")
        return self


class ServicePrices(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eks_control_plane_hourly: float = Field(gt=0, description="EKS cluster, standard support, per hour")
    eks_extended_support_hourly: float = Field(
        gt=0, description="EKS extended support, added per cluster-hour while the version is past standard support"
    )
    nat_gateway_hourly: float = Field(gt=0, description="NAT gateway, per gateway-hour")
    nat_gateway_per_gb: float = Field(gt=0, description="NAT gateway, per GB processed")
    public_ipv4_hourly: float = Field(gt=0, description="Public IPv4 address (the NAT gateway's EIP), per hour")
    interface_endpoint_hourly_per_az: float = Field(gt=0, description="Interface VPC endpoint, per AZ-hour")
    interface_endpoint_per_gb: float = Field(gt=0, description="Interface VPC endpoint, per GB processed")
    s3_standard_gb_month: float = Field(gt=0, description="S3 Standard, per GB-month")
    s3_glacier_flexible_gb_month: float = Field(gt=0, description="S3 Glacier Flexible Retrieval, per GB-month")
    ebs_gp3_gb_month: float = Field(gt=0, description="EBS gp3, per GB-month")
    cloudwatch_alarm_month: float = Field(gt=0, description="CloudWatch standard-resolution alarm, per month")
    cloudwatch_dashboard_month: float = Field(gt=0, description="CloudWatch dashboard, per month")
    cloudwatch_logs_ingest_per_gb: float = Field(gt=0, description="CloudWatch Logs ingestion, per GB")
    kms_key_month: float = Field(gt=0, description="KMS customer managed key, per month")
    ecr_storage_gb_month: float = Field(gt=0, description="ECR image storage, per GB-month")


class RegionPrices(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ec2: dict[str, InstancePrice]
    services: ServicePrices
    # Set by the refresh tool for a region it fetched; otherwise the table's own date and source apply.
    as_of: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str | None = None


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    as_of: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="Date the prices were taken")
    currency: str = Field(pattern=r"^USD$")
    source: str = Field(min_length=20, description="Where the prices came from and how")
    regions: dict[str, RegionPrices]

    def region(self, name: str) -> RegionPrices:
        try:
            return self.regions[name]
        except KeyError:
            raise PriceTableError(
                f"region {name!r} is not in the price table (has: {', '.join(sorted(self.regions))}); "
                "add it with `python -m infra.pricing.refresh --region " + name + "`"
            ) from None

    def dated_source(self, region: str) -> tuple[str, str]:
        """(as of, source) of one region's prices."""
        prices = self.region(region)
        return prices.as_of or self.as_of, prices.source or self.source

    def dated_instance(self, region: str, instance_type: str) -> tuple[str, str]:
        """(as of, source) of one instance type's prices: its own where the row has them, else its region's."""
        row = self.instance(region, instance_type)
        as_of, source = self.dated_source(region)
        return row.as_of or as_of, row.source or source

    def instance(self, region: str, instance_type: str) -> InstancePrice:
        prices = self.region(region).ec2
        try:
            return prices[instance_type]
        except KeyError:
            raise PriceTableError(
                f"instance type {instance_type!r} has no price for {region} in the price table "
                f"(has: {', '.join(sorted(prices))}); add it to infra/pricing/prices.json or refresh with "
                f"`python -m infra.pricing.refresh --region {region} --instance-type {instance_type}`"
            ) from None


def load_prices(path: Path = DEFAULT_TABLE) -> PriceTable:
    return PriceTable.model_validate_json(path.read_text())
