// Package charts holds inferrail's Helm chart (charts/inferrail) and the
// test that renders it in-process with helm.sh/helm/v3 for several value
// sets (testdata/values-*.yaml and the examples/k8s values), decodes every
// manifest strictly into its k8s.io/api type, and checks the invariants
// between the objects and the live configuration they carry. Nothing
// rendered is committed: the test generates it.
package charts
