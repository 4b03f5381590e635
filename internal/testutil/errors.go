package testutil

import (
	"errors"
	"strings"
	"testing"
)

// CheckErr fails tb unless err is what a table row wants: no error when wantErr is nil
// and wantMsg is ""; otherwise an error that wraps wantErr (when given) and whose text
// contains wantMsg (when given), so that a row can pin both the sentinel callers test
// with errors.Is and the field, value and bound a message must name. call names the
// call for the failure message.
func CheckErr(tb testing.TB, call string, err, wantErr error, wantMsg string) {
	tb.Helper()
	switch {
	case wantErr == nil && wantMsg == "" && err != nil:
		tb.Fatalf("%s: unexpected error %v", call, err)
	case wantErr != nil && !errors.Is(err, wantErr):
		tb.Fatalf("%s: error %v, want one wrapping %v", call, err, wantErr)
	case wantMsg != "" && (err == nil || !strings.Contains(err.Error(), wantMsg)):
		tb.Fatalf("%s: error %v, want a message containing %q", call, err, wantMsg)
	}
}
