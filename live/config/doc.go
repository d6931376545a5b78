// Package config is the configuration of `inferrail live`, the production
// OpenAI-compatible proxy: listen addresses, timeouts, retries, health
// checks and ejection, engine scraping, edge tokenization, the decision log,
// tenancy (auth: keys, the key store, the rate limiter in process or in
// Redis, usage metering), and the served models with their policies,
// admission rules, queues, key limits and replicas (listed, or found
// through DNS groups).
//
// Start with Config (config.go) and Parse: decoding is strict (an unknown or
// repeated key is an error), fields the file leaves out keep the values of
// Default and DefaultModel, and the result is validated once. Every problem
// is reported at once as a FieldError naming its YAML path, such as
// models[1].replicas[0].url, and its line; errors.Join joins them. decode.go
// walks the YAML tree; validate.go holds every rule.
//
// examples/live.yaml at the top of the repository is a commented example.
package config
