// Package check validates deploy/kubernetes/roomcast.yaml and the three regions' manifests of
// deploy/regions/kubernetes/ against the Kubernetes API's own Go types (k8s.io/api), strictly:
// a field the API does not have, or a value of the wrong type, fails, as `kubectl apply
// --validate=strict` would. It is a module of its own so that the roomcast module does not
// require the Kubernetes API; it holds tests only.
package check
