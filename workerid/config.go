package workerid

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidConfig is returned when a configuration value is out of range or two values
// contradict each other; the message names the fields, values and bounds.
//
// Every configuration of this package comes from its DefaultXConfig function and is
// checked by its Validate method, which every constructor calls: a zero value is not a
// request for the default but a value like any other (a MaxWorkerID of 0 means worker
// ID 0 only), and Validate refuses it where it makes no sense.
var ErrInvalidConfig = errors.New("invalid configuration")

// invalid returns an error wrapping ErrInvalidConfig for component ("KV registry", ...).
func invalid(component, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, component, fmt.Sprintf(format, args...))
}

// CheckLeaseTTL is the one rule between a worker-ID lease's TTL and its renew interval
// (the heartbeat): at least 4 renewals, so that a lease survives two failed renewals
// before the generator is suspended at TTL/2. The dispenser's --lease-ttl, the KV
// registry and the heartbeat each check it here.
func CheckLeaseTTL(ttl, renew time.Duration) error {
	if ttl < 4*renew {
		return fmt.Errorf("lease TTL %s is shorter than 4 x the renew interval %s (%s): a lease must survive two failed renewals before the generator stops at TTL/2",
			ttl, renew, 4*renew)
	}
	return nil
}

// duration is a named duration setting, for checks over several of them.
type duration struct {
	name string
	v    time.Duration
}

// checkPositive refuses the first duration that is not above zero.
func checkPositive(component string, ds ...duration) error {
	for _, d := range ds {
		if d.v <= 0 {
			return invalid(component, "%s is %s, want > 0", d.name, d.v)
		}
	}
	return nil
}

// checkMaxWorkerID refuses a negative highest worker ID.
func checkMaxWorkerID(component string, maxWorkerID int64) error {
	if maxWorkerID < 0 {
		return invalid(component, "MaxWorkerID is %d, want >= 0 (the snowflake layout's highest worker ID, %d by default)",
			maxWorkerID, DefaultMaxWorkerID)
	}
	return nil
}

// maxReplicas is JetStream's limit on stream replicas.
const maxReplicas = 5

// checkReplicas refuses a replica count JetStream does not accept.
func checkReplicas(component string, replicas int) error {
	if replicas < 1 || replicas > maxReplicas {
		return invalid(component, "Replicas is %d, want 1 to %d", replicas, maxReplicas)
	}
	return nil
}
