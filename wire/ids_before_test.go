package wire

import (
	"slices"
	"strconv"
)

// appendTextBefore is AppendIDs's text encoding before issue 22 (main at d9fb719), kept
// so that BenchmarkAppendIDs measures the old and the new encoder in one run: on a shared
// host, figures from two runs minutes apart are not comparable.
func appendTextBefore(dst []byte, ids []int64) []byte {
	var line [24]byte // in a run: '\n' then the current ID's decimal digits
	digits := 0       // how many; 0: not in a run
	last := 0         // where the previous ID's digits start in dst
	for i, id := range ids {
		if i > 0 && id == ids[i-1]+1 {
			if digits == 0 {
				line[0] = '\n'
				digits = copy(line[1:], dst[last:])
			}
			if raiseBefore(&line, digits) {
				if cap(dst)-len(dst) < len(line) {
					dst = slices.Grow(dst, len(line)+(len(ids)-i)*(digits+1))
				}
				n := len(dst)
				dst = dst[:n+len(line)]
				*(*[len(line)]byte)(dst[n:]) = line
				dst = dst[:n+1+digits]
				continue
			}
		}
		if i > 0 {
			dst = append(dst, '\n')
		}
		digits, last = 0, len(dst)
		dst = strconv.AppendInt(dst, id, 10)
	}
	return dst
}

func raiseBefore(line *[24]byte, digits int) bool {
	for i := digits; i >= 1; i-- {
		if line[i] != '9' {
			line[i]++
			return true
		}
		line[i] = '0'
	}
	return false
}
