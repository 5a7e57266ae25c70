package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBudgetPauses: a create's budget does not run while paused (a wait
// for an SDN apply), runs out after it, and says why.
func TestBudgetPauses(t *testing.T) {
	ctx, cancel := withBudget(context.Background(), 2*time.Second)
	defer cancel()
	resume := pauseBudget(ctx)
	inner := pauseBudget(ctx) // nested pauses: the budget runs when the last ends
	time.Sleep(2500 * time.Millisecond)
	inner()
	if ctx.Err() != nil {
		t.Fatalf("the budget ran out while paused: %v", context.Cause(ctx))
	}
	resume()
	resume() // a second resume changes nothing
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the budget never ran out after its pause")
	}
	if err := budgetErr(ctx, context.Canceled); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errCreateTimeout) {
		t.Errorf("budgetErr: %v", err)
	}
	if resume := pauseBudget(context.Background()); resume == nil {
		t.Error("pauseBudget of a context without a budget")
	}
}
