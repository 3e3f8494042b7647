output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr" {
  description = "IPv4 CIDR block of the VPC."
  value       = aws_vpc.this.cidr_block
}

output "private_subnet_ids" {
  description = "IDs of the three private subnets, in the order of var.azs."
  value       = aws_subnet.private[*].id
}

output "public_subnet_ids" {
  description = "IDs of the three public subnets, in the order of var.azs."
  value       = aws_subnet.public[*].id
}

output "private_route_table_ids" {
  description = "IDs of the private route tables, one per zone (for gateway endpoints such as S3)."
  value       = aws_route_table.private[*].id
}

output "nat_public_ips" {
  description = "Public IPs of the NAT gateways (what third parties see as the cluster's egress address)."
  value       = aws_eip.nat[*].public_ip
}
