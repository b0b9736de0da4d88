// Package testsupport starts the real parts that slidegate's tests run
// against: redis-server processes (standalone and a 3-master Redis Cluster) on
// free loopback ports, and the envtest control plane built by hack/envtest.sh.
//
// A missing dependency is a skip on a developer's machine and a failure under
// CI=true, so a CI run can never go green by testing nothing.
package testsupport
