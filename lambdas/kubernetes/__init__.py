"""The Kubernetes API of the EKS cluster, from Lambda, without kubectl: tokens and a client."""
