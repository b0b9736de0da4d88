package limiter

// grouping says which keys one script may touch together.
type grouping int

const (
	groupAll  grouping = iota // standalone/sentinel: one server holds every key
	groupSlot                 // Redis Cluster: keys of one hash slot
	groupTag                  // other sharded clients: keys of one hash tag
)

// group is the requests of one Decide whose keys one script may touch.
type group struct {
	slot int    // for groupSlot
	tag  string // for groupTag
	idx  []int
	keys []string
	op   *op
	// room for the common one-request Decide
	idxBuf [1]int
	keyBuf [1]string
}

// groups splits the valid requests by what one script may touch; keys[i]
// is the key of reqs[i].
func (l *Limiter) groups(reqs []Request, keys []string, allValid bool) []group {
	if len(reqs) == 1 && allValid {
		gs := make([]group, 1)
		g := &gs[0]
		g.idxBuf[0], g.keyBuf[0] = 0, keys[0]
		g.idx, g.keys = g.idxBuf[:], g.keyBuf[:]
		return gs
	}
	if l.grouping == groupAll || len(reqs) == 1 {
		g := group{idx: make([]int, 0, len(reqs)), keys: make([]string, 0, len(reqs))}
		for i := range reqs {
			if allValid || validRequest(&reqs[i]) == nil {
				g.idx = append(g.idx, i)
				g.keys = append(g.keys, keys[i])
			}
		}
		if len(g.idx) == 0 {
			return nil
		}
		return []group{g}
	}
	var gs []group
	for i := range reqs {
		if !allValid && validRequest(&reqs[i]) != nil {
			continue
		}
		k := keys[i]
		s, tag := 0, ""
		if l.grouping == groupSlot {
			s = slot(k)
		} else {
			tag = hashTag(k)
		}
		found := false
		for gi := range gs {
			if gs[gi].slot == s && gs[gi].tag == tag {
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
