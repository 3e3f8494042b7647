# Plan-only checks of the IRSA roles against a mocked AWS provider. The policy documents are rendered by
# the real aws_iam_policy_document data source (override_data would hide them), so these read the
# JSON the roles would get.
mock_provider "aws" {}

variables {
  name                = "sluice-test"
  oidc_provider_arn   = "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE"
  oidc_provider_url   = "https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE"
  namespace           = "sluice"
  weights_bucket_arn  = "arn:aws:s3:::sluice-test-weights"
  weights_kms_key_arn = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  files_bucket_arn    = "arn:aws:s3:::sluice-test-files"
  files_kms_key_arn   = "arn:aws:kms:us-east-1:123456789012:key/66666666-7777-8888-9999-000000000000"
}

run "one_role_per_service_account_trusting_only_it" {
  command = plan

  assert {
    condition     = toset(keys(aws_iam_role.this)) == toset(["replica", "build", "gateway", "control_plane"])
    error_message = "one role per Sluice service account"
  }

  assert {
    condition     = aws_iam_role.this["control_plane"].name == "sluice-test-control-plane"
    error_message = "role names are <name>-<key with hyphens>"
  }

  assert {
    condition = alltrue([for key, role in aws_iam_role.this :
      jsondecode(role.assume_role_policy).Statement[0].Condition.StringEquals == {
        "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE:sub" = "system:serviceaccount:sluice:${var.service_accounts[key]}"
        "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE:aud" = "sts.amazonaws.com"
    }])
    error_message = "each role must trust exactly its namespace/service account, audience sts.amazonaws.com"
  }

  assert {
    condition = alltrue([for role in aws_iam_role.this :
      length(jsondecode(role.assume_role_policy).Statement) == 1 &&
      jsondecode(role.assume_role_policy).Statement[0].Principal.Federated == var.oidc_provider_arn &&
    jsondecode(role.assume_role_policy).Statement[0].Action == "sts:AssumeRoleWithWebIdentity"])
    error_message = "trust must be web identity through the cluster's OIDC provider only"
  }

  assert {
    condition     = jsondecode(aws_iam_role.this["build"].assume_role_policy).Statement[0].Condition.StringEquals["oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE:sub"] == "system:serviceaccount:sluice:sluice-build"
    error_message = "the build role trusts sluice/sluice-build"
  }
}

run "replica_reads_and_decrypts_only" {
  command = plan

  assert {
    condition = toset(flatten([for s in jsondecode(aws_iam_role_policy.replica.policy).Statement : s.Action])) == toset(
    ["s3:ListBucket", "s3:GetObject", "kms:Decrypt"])
    error_message = "replica may list, get and decrypt, nothing else"
  }

  assert {
    condition     = !strcontains(aws_iam_role_policy.replica.policy, "Put") && !strcontains(aws_iam_role_policy.replica.policy, "Delete")
    error_message = "replica must not write or delete"
  }
}

run "gateway_reads_only_manifests_and_tokenizers" {
  command = plan

  assert {
    condition = toset(flatten([for s in jsondecode(aws_iam_role_policy.gateway.policy).Statement : s.Action])) == toset(
    ["s3:GetObject", "kms:Decrypt"])
    error_message = "gateway may get objects and decrypt, nothing else (no list, no write)"
  }

  assert {
    condition = alltrue([for r in flatten([for s in jsondecode(aws_iam_role_policy.gateway.policy).Statement : s.Resource if s.Action == "s3:GetObject"]) :
    can(regex("^arn:aws:s3:::sluice-test-weights/engines/\\*/(manifest|tokenizer|tokenizer_config|config|generation_config|special_tokens_map)\\.json$", r))])
    error_message = "gateway reads only manifests and tokenizer files under engines/, never weights"
  }
}

run "gateway_reads_writes_and_lists_only_the_files_prefix" {
  command = plan

  assert {
    condition = toset(flatten([for s in jsondecode(aws_iam_role_policy.gateway_files.policy).Statement : s.Action])) == toset(
    ["s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "kms:GenerateDataKey", "kms:Decrypt"])
    error_message = "the gateway's files policy: list, get, put, delete, and the key to encrypt and decrypt; nothing else"
  }

  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.gateway_files.policy).Statement : s.Resource if contains(flatten([s.Action]), "s3:PutObject")] == [
    "arn:aws:s3:::sluice-test-files/files/*"]
    error_message = "the gateway writes and deletes only under the files bucket's prefix"
  }

  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.gateway_files.policy).Statement : [s.Resource, s.Condition.StringLike["s3:prefix"]] if s.Action == "s3:ListBucket"] == [
    ["arn:aws:s3:::sluice-test-files", "files/*"]]
    error_message = "the gateway lists only the files bucket, under its prefix"
  }

  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.gateway_files.policy).Statement : [s.Resource, s.Condition.StringLike["kms:ViaService"]] if contains(flatten([s.Action]), "kms:GenerateDataKey")] == [
    [var.files_kms_key_arn, "s3.*.amazonaws.com"]]
    error_message = "the gateway uses only the files bucket's key, and only through S3"
  }

  assert {
    condition     = !strcontains(aws_iam_role_policy.gateway_files.policy, "sluice-test-weights") && !strcontains(aws_iam_role_policy.gateway_files.policy, "11111111-2222")
    error_message = "the gateway's files policy must not name the weights bucket or its key"
  }
}

run "build_writes_only_under_engines" {
  command = plan

  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.build.policy).Statement : s.Resource if contains(flatten([s.Action]), "s3:PutObject")] == [
    "arn:aws:s3:::sluice-test-weights/engines/*"]
    error_message = "build may put objects only under engines/"
  }

  assert {
    condition     = contains(flatten([for s in jsondecode(aws_iam_role_policy.build.policy).Statement : s.Action]), "kms:GenerateDataKey")
    error_message = "build must be able to encrypt with the bucket key"
  }

  assert {
    condition     = !strcontains(aws_iam_role_policy.build.policy, "Delete") && !strcontains(aws_iam_role_policy.build.policy, "\"s3:*\"")
    error_message = "build must not delete or hold s3:*"
  }
}

run "rejects_bad_inputs" {
  command = plan

  variables {
    service_accounts   = { replica = "r", build = "b", gateway = "g", admin = "a" }
    engines_prefix     = "*"
    weights_bucket_arn = "arn:aws:s3:::sluice-test-weights/*"
    files_bucket_arn   = "arn:aws:s3:::*"
    files_prefix       = "/files"
  }

  expect_failures = [var.service_accounts, var.engines_prefix, var.weights_bucket_arn, var.files_bucket_arn, var.files_prefix]
}
