# Plans the module against a mocked AWS provider (no credentials, no network) and checks that the
# database is private, encrypted, backed up and reachable only from the allowed groups.

mock_provider "aws" {
  mock_data "aws_partition" {
    defaults = {
      partition = "aws"
    }
  }
}

variables {
  name                       = "sluice-test"
  vpc_id                     = "vpc-0123456789abcdef0"
  subnet_ids                 = ["subnet-aaaa", "subnet-bbbb", "subnet-cccc"]
  allowed_security_group_ids = ["sg-nodes"]
  tags                       = { Project = "sluice" }
}

run "private_encrypted_and_backed_up" {
  command = plan

  assert {
    condition     = !aws_db_instance.this.publicly_accessible
    error_message = "The database must not be publicly accessible."
  }

  assert {
    condition     = aws_db_instance.this.storage_encrypted && aws_db_instance.this.performance_insights_enabled
    error_message = "Storage and Performance Insights must be encrypted."
  }

  assert {
    condition     = aws_db_instance.this.manage_master_user_password && aws_db_instance.this.password == null
    error_message = "RDS must manage the master password in Secrets Manager; no password in the configuration."
  }

  assert {
    condition     = aws_db_instance.this.deletion_protection && !aws_db_instance.this.skip_final_snapshot
    error_message = "Deletion protection must be on by default and a final snapshot taken."
  }

  assert {
    condition     = aws_db_instance.this.backup_retention_period == 14 && aws_db_instance.this.multi_az
    error_message = "Backups must be kept 14 days by default, with a multi-AZ standby."
  }

  assert {
    condition     = aws_db_instance.this.engine == "postgres" && aws_db_parameter_group.this.family == "postgres16"
    error_message = "The parameter group family must follow the engine's major version."
  }

  assert {
    condition     = anytrue([for p in aws_db_parameter_group.this.parameter : p.name == "rds.force_ssl" && p.value == "1"])
    error_message = "TLS must be forced (rds.force_ssl = 1)."
  }

  assert {
    condition     = aws_db_subnet_group.this.subnet_ids == toset(var.subnet_ids)
    error_message = "The database must live in the given (private) subnets."
  }

  assert {
    condition = (
      length(aws_vpc_security_group_ingress_rule.from_allowed) == 1 &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].referenced_security_group_id == "sg-nodes" &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].from_port == 5432 &&
      aws_vpc_security_group_ingress_rule.from_allowed[0].cidr_ipv4 == null
    )
    error_message = "Only the allowed security group may reach port 5432, and no CIDR."
  }

  assert {
    condition     = aws_kms_key.this.enable_key_rotation && length(aws_iam_role.monitoring) == 1
    error_message = "The key must rotate, and Enhanced Monitoring gets its role."
  }
}

run "dev_can_turn_off_protection_and_monitoring" {
  command = plan

  variables {
    deletion_protection   = false
    monitoring_interval_s = 0
    engine_version        = "17.2"
  }

  assert {
    condition     = !aws_db_instance.this.deletion_protection && length(aws_iam_role.monitoring) == 0
    error_message = "deletion_protection and monitoring follow their variables."
  }

  assert {
    condition     = aws_db_parameter_group.this.family == "postgres17"
    error_message = "A pinned minor version keeps the major's parameter family."
  }
}

run "backups_cannot_be_turned_off" {
  command = plan

  variables {
    backup_retention_days = 0
  }

  expect_failures = [var.backup_retention_days]
}

run "reserved_master_username_is_refused" {
  command = plan

  variables {
    master_username = "postgres"
  }

  expect_failures = [var.master_username]
}
