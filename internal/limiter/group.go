package limiter

import (
	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// grouping says which keys one script may touch together.
type grouping int

const (
	groupAll  grouping = iota // standalone/sentinel: one server holds every key
	groupSlot                 // Redis Cluster: keys of one hash slot
	groupTag                  // other sharded clients: keys of one hash tag
)

// groupingOf is the grouping rdb's kind of client needs.
func groupingOf(rdb redis.UniversalClient) grouping {
	switch rdb.(type) {
	case *redis.Client:
		return groupAll
	case *redis.ClusterClient:
		return groupSlot
	default:
		return groupTag
	}
}

// group is the requests of one Decide whose keys one script may touch,
// and what Redis said about them.
type group struct {
	slot int    // for groupSlot
	tag  string // for groupTag
	idx  []int  // the requests, by index in the Decide call
	keys []string
	op   *op
	// reply is the decoded reply of op; err, when set, is why Redis did
	// not decide the group (reply is then unset).
	reply decideReply
	err   error
	// admitted says the group admitted into some key, which an overall
	// denial must undo.
	admitted bool
	// room for the common one-request Decide
	idxBuf   [1]int
	keyBuf   [1]string
	replyBuf [1]keyReply
}

// split groups the valid requests by what one script may touch: keys[i]
// is the key of request i, "" when the request is invalid (it is in no
// group).
func (gr grouping) split(keys []string) []group {
	if len(keys) == 1 && keys[0] != "" {
		gs := make([]group, 1)
		g := &gs[0]
		g.idxBuf[0], g.keyBuf[0] = 0, keys[0]
		g.idx, g.keys = g.idxBuf[:], g.keyBuf[:]
		return gs
	}
	if (gr == groupAll || len(keys) == 1) && len(keys) <= maxScriptKeys {
		g := group{idx: make([]int, 0, len(keys)), keys: make([]string, 0, len(keys))}
		for i, k := range keys {
			if k != "" {
				g.idx = append(g.idx, i)
				g.keys = append(g.keys, k)
			}
		}
		if len(g.idx) == 0 {
			return nil
		}
		return []group{g}
	}
	var gs []group
	for i, k := range keys {
		if k == "" {
			continue
		}
		s, tag := 0, ""
		switch gr {
		case groupSlot:
			s = redisschema.Slot(k)
		case groupTag:
			tag = redisschema.HashTag(k)
		}
		found := false
		for gi := range gs {
			// A script takes at most maxScriptKeys keys: more of one slot
			// are decided as keys of different slots are.
			if gs[gi].slot == s && gs[gi].tag == tag && len(gs[gi].idx) < maxScriptKeys {
				gs[gi].idx = append(gs[gi].idx, i)
				gs[gi].keys = append(gs[gi].keys, k)
				found = true
				break
			}
		}
		if !found {
			gs = append(gs, group{slot: s, tag: tag, idx: []int{i}, keys: []string{k}})
		}
	}
	return gs
}
