# Terraform and the google provider. Credentials come from the environment running terraform
# (`gcloud auth application-default login`, or a CI identity), never from these files.

terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.10, < 8"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}
