# Entry points; each is a thin wrapper over a script in hack/.
.PHONY: demo demo-kwok test check crds code-order cluster-up cluster-down tools bench chaos release

demo:        ## local cluster with a real node, the operator installed by Helm, a sample SandboxRun
	hack/demo.sh

demo-kwok:   ## the quick path on the kwok node only (no container runs; the demo plays the workload)
	hack/demo-kwok.sh

test:        ## the whole suite (what CI runs): make check, control plane up, every test, down
	hack/test.sh

check:       ## every static check, no cluster: fmt, clippy, generated files, cycles, Dockerfile, fn length
	hack/check.sh

crds:        ## regenerate crds/ and the chart's CRD copy from src/api.rs, config/rbac from the chart
	hack/gen.sh

code-order:  ## profile a replica on the local cluster and rewrite link/hot-symbols.txt (its link order)
	hack/code-order.sh

tools:       ## build the pinned control-plane and real-node binaries into the cache
	hack/build-tools.sh

cluster-up:
	hack/local-cluster.sh up

cluster-down:
	hack/local-cluster.sh down

release:     ## a versioned release into dist/VERSION/ (make release VERSION=x.y.z [REGISTRY=host:port] [PUSH=1])
	hack/release.sh $(VERSION) $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(PUSH),--push)

chaos:       ## the fault tests on the bed (kubelet stopped mid-drain, a node lost mid-run), alone: hack/chaos.sh
	hack/chaos.sh

bench:       ## every benchmark in bench/ (or BENCH="webhook_latency drain_memory"), JSON in target/bench-results/
	hack/bench.sh $(BENCH)
