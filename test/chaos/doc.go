// Package chaos holds the fault tests of the clustered deployment (docs/reliability.md): each
// starts the deployment as real processes on loopback (internal/testkit/procs: three
// nats-server processes with replicated JetStream, two ChatLinks, two services processes, S3,
// the CDN pusher), puts a room under load with the Go SDK, breaks something (kill -9, a NATS
// server restart) and checks what the members got. `make chaos` runs them and writes their
// figures to docs/reliability.md. It has no code but its tests; they are skipped with -short.
package chaos
