package tenancy_test

import (
	"testing"

	"github.com/inferrail/inferrail/router/gateway"
	"github.com/inferrail/inferrail/tenancy"
)

// A key's priority feeds the gateway core's queue: the bounds agree.
func TestMaxPriorityMatchesGateway(t *testing.T) {
	if tenancy.MaxPriority != gateway.MaxPriorityLimit {
		t.Errorf("tenancy.MaxPriority = %d, gateway.MaxPriorityLimit = %d", tenancy.MaxPriority, gateway.MaxPriorityLimit)
	}
}
