terraform {
  # 1.10: the S3 backend's native state locking (use_lockfile) needs it.
  required_version = ">= 1.10"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }

  # Remote state, configured but not needed by the offline checks (they run init -backend=false). The
  # state bucket is per account, so it is given at init:
  #   terraform init -backend-config="bucket=<state bucket>"
  backend "s3" {
    key          = "sluice/prod/terraform.tfstate"
    region       = "us-east-1"
    encrypt      = true
    use_lockfile = true
  }
}
