# The AWS data sources as both environments' plan tests mock them (mock_provider "aws" { source = ... }).
mock_data "aws_caller_identity" {
  defaults = {
    account_id = "123456789012"
  }
}
mock_data "aws_partition" {
  defaults = {
    partition = "aws"
  }
}
# The mock's generated strings are 8 characters, shorter than ElastiCache accepts for a token.
mock_data "aws_secretsmanager_random_password" {
  defaults = {
    random_password = "mockmockmockmockmockmockmockmockmockmockmockmockmockmockmockmock"
  }
}
# The mock's random strings are not JSON; a policy attribute must be.
mock_data "aws_iam_policy_document" {
  defaults = {
    json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
  }
}
