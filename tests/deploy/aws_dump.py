"""Print the EC2 state of a (moto) endpoint as JSON: security groups and instances.

    python aws_dump.py ENDPOINT_URL REGION
"""
from __future__ import annotations

import json
import sys

import boto3


def main() -> None:
    endpoint, region = sys.argv[1], sys.argv[2]
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=region)
    groups = ec2.describe_security_groups()["SecurityGroups"]
    instances = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    json.dump({"security_groups": groups, "instances": instances}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
