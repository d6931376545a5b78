package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

func newEPPCmd(stdout, stderr io.Writer, keepAwake func() error) *cobra.Command {
	var path string
	var check bool
	cmd := &cobra.Command{
		Use:   "epp",
		Short: "Run the endpoint picker (Envoy ext_proc) that Kubernetes inference gateways route with",
		Long: `epp serves the Gateway API Inference Extension's endpoint-picker protocol: an
Envoy ext_proc gRPC service (on epp.listen) that Envoy Gateway, kgateway,
Istio or a GKE gateway asks where each inference request goes. It reads the
request's headers and body, tokenizes and routes it exactly as live does (the
same gateway core: every policy, the KV index, admission and the queue), and
answers with the x-gateway-destination-endpoint header and envoy.lb metadata,
honouring the gateway's subset hint; rejections are live's (429 and 503 with
Retry-After, 400) as immediate responses. It then watches the response go by
to learn the engine's usage. Envoy carries the bytes. gRPC health serves
liveness, readiness and envoy.service.ext_proc.v3.ExternalProcessor; the admin
listener serves the same metrics, /livez and /readyz as live.

The configuration is live's YAML (examples/live.yaml), with its epp section:
epp.listen (default 127.0.0.1:9002) and epp.pool {name, namespace, model,
kubeconfig, kv_events_port}: with a pool name, the model's replicas are the
ready pods of that InferencePool (inference.networking.k8s.io/v1) at its first
target port, watched with the in-cluster service account or the kubeconfig,
and its InferenceObjectives give requests their priority; without one, they
come from replicas and dns as in live. epp.leader_election runs several
pickers for one pool, only the holder of a Lease ready. --check validates it, loads every
tokenizer and profile, prints what it would run and exits.

Envoy's ext_proc filter needs: processing_mode with request_header_mode SEND,
request_body_mode FULL_DUPLEX_STREAMED (or BUFFERED), response_header_mode
SEND, response_body_mode FULL_DUPLEX_STREAMED (for usage; NONE works without
it), request_trailer_mode and response_trailer_mode SEND or SKIP;
allow_mode_override false; a message_timeout longer than a queued request
waits (queue.timeout; 1000s as GIE's charts set it); failure_mode_allow as
you want the gateway to behave when the picker is down. Run one replica, or
several with epp.leader_election.enabled (only the lease holder is ready; the
others watch the pool and take over when it lapses or is given up).`,
		Example: `  inferrail epp --config examples/live.yaml --check
  inferrail epp --config /etc/inferrail/live.yaml
  grpc_health_probe -addr 127.0.0.1:9002 -tls -tls-no-verify -service readiness
  curl -s 127.0.0.1:9090/metrics | grep inferrail_requests_total

  # The Envoy side (an ext_proc HTTP filter):
  #   grpc_service: {envoy_grpc: {cluster_name: inferrail-epp}}   # TLS to :9002 (epp.secure_serving; false: h2c)
  #   processing_mode:
  #     request_header_mode: SEND
  #     request_body_mode: FULL_DUPLEX_STREAMED
  #     request_trailer_mode: SEND
  #     response_header_mode: SEND
  #     response_body_mode: FULL_DUPLEX_STREAMED
  #     response_trailer_mode: SEND
  #   allow_mode_override: false
  #   message_timeout: 1000s
  #   failure_mode_allow: false`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, s, err := newLiveServer(path, stderr, serving(check, keepAwake))
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.CheckEPP(); err != nil {
				return usageError{err}
			}
			if check {
				fmt.Fprintf(stdout, "%s: ok\n%s", path, cfg.Summary())
				return nil
			}
			// client-go's leader election logs through klog: into the
			// process log with the rest.
			klog.SetSlogLogger(s.Logger())
			return serveUntilSignal(cmd.Context(), cfg, s.Logger(), s.ServeEPP)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "YAML configuration, live's with its epp section (required)")
	cmd.Flags().BoolVar(&check, "check", false, "validate the configuration, load its tokenizers and profiles, print a summary and exit")
	return cmd
}
