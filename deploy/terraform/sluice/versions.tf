terraform {
  # 1.10: the S3 backend's native state locking (use_lockfile) needs it.
  required_version = ">= 1.10"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }

  # Remote state, configured but not needed by the offline checks (they run init -backend=false). Partial:
  # the state key is the environment's (envs/<env>.s3.tfbackend) and the bucket is per account, both given
  # at init (README.md: Applying a root):
  #   terraform init -backend-config=envs/prod.s3.tfbackend -backend-config="bucket=<state bucket>"
  backend "s3" {
    region       = "us-east-1"
    encrypt      = true
    use_lockfile = true
  }
}
