# Plan-only checks against a mocked AWS provider: no credentials, no API calls.
mock_provider "aws" {
  # The mock's random strings are not JSON; a policy attribute must be.
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }
}

variables {
  name = "sluice-test"
  cidr = "10.0.0.0/16"
  azs  = ["us-east-1a", "us-east-1b", "us-east-1c"]
}

run "three_zones_by_default" {
  command = plan

  assert {
    condition     = length(distinct(aws_subnet.private[*].availability_zone)) == 3
    error_message = "private subnets must span three availability zones"
  }

  assert {
    condition     = length(distinct(aws_subnet.public[*].availability_zone)) == 3
    error_message = "public subnets must span three availability zones"
  }

  assert {
    condition     = alltrue([for s in aws_subnet.public : !s.map_public_ip_on_launch])
    error_message = "public subnets must not hand out public IPs to instances"
  }

  assert {
    condition     = length(aws_nat_gateway.this) == 3
    error_message = "one NAT gateway per zone by default"
  }

  assert {
    condition     = length(aws_flow_log.this) == 0
    error_message = "flow logs are off unless asked for"
  }

  assert {
    condition     = length(distinct(concat(aws_subnet.private[*].cidr_block, aws_subnet.public[*].cidr_block))) == 6
    error_message = "six distinct subnet CIDRs expected"
  }

  assert {
    condition     = aws_subnet.private[0].cidr_block == "10.0.0.0/19" && aws_subnet.public[2].cidr_block == "10.0.248.0/22"
    error_message = "subnet layout changed: private /19s from the bottom, public /22s from the top"
  }
}

run "single_nat_for_dev" {
  command = plan

  variables {
    single_nat_gateway = true
    enable_flow_logs   = true
  }

  assert {
    condition     = length(aws_nat_gateway.this) == 1 && length(aws_route.private_nat) == 3
    error_message = "single_nat_gateway: one NAT gateway routing all three private route tables"
  }

  assert {
    condition     = aws_flow_log.this[0].traffic_type == "ALL"
    error_message = "flow logs must record all traffic"
  }
}

run "rejects_bad_inputs" {
  command = plan

  variables {
    azs  = ["us-east-1a", "us-east-1b"]
    cidr = "10.0.0.0"
  }

  expect_failures = [var.azs, var.cidr]
}
