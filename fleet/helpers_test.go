package fleet

import "github.com/inferrail/inferrail/workload"

func workloadDefault(name string) (workload.Config, error) { return workload.DefaultConfig(name) }
