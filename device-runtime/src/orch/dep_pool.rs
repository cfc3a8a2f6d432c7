//! The DepList pool: fan-out edges (producer -> consumer) as singly linked
//! lists of nodes drawn from a fixed pool with a free list.

/// "No node".
pub const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    /// The consumer's task id.
    consumer: u64,
    next: u32,
}

/// `N` edge nodes.
pub struct DepPool<const N: usize> {
    nodes: [Node; N],
    free: u32,
    used: usize,
}

impl<const N: usize> DepPool<N> {
    /// An empty pool.
    pub const fn new() -> Self {
        let mut nodes = [Node {
            consumer: 0,
            next: NIL,
        }; N];
        let mut i = 0;
        while i + 1 < N {
            nodes[i].next = (i + 1) as u32;
            i += 1;
        }
        DepPool {
            nodes,
            free: if N == 0 { NIL } else { 0 },
            used: 0,
        }
    }

    /// Frees every node, in place (as [`DepPool::new`], without building
    /// a pool of `N` nodes on the stack): the lists that held them are
    /// dropped with it.
    pub fn reset(&mut self) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            node.next = if i + 1 < N { (i + 1) as u32 } else { NIL };
        }
        self.free = if N == 0 { NIL } else { 0 };
        self.used = 0;
    }

    /// Nodes in use.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Nodes free.
    pub fn available(&self) -> usize {
        N - self.used
    }

    /// Pushes `consumer` onto the list starting at `*head`. `false` if the
    /// pool is empty (callers check [`DepPool::available`] first).
    pub fn push(&mut self, head: &mut u32, consumer: u64) -> bool {
        let i = self.free;
        let Some(node) = self.nodes.get_mut(i as usize) else {
            return false;
        };
        self.free = node.next;
        *node = Node {
            consumer,
            next: *head,
        };
        *head = i;
        self.used += 1;
        true
    }

    /// Whether the list at `head` starts with an edge to `consumer` (the
    /// last one pushed onto it).
    #[inline(always)]
    pub fn starts_with(&self, head: u32, consumer: u64) -> bool {
        self.nodes
            .get(head as usize)
            .is_some_and(|node| node.consumer == consumer)
    }

    /// Removes and returns the first consumer of the list at `*head`.
    pub fn pop(&mut self, head: &mut u32) -> Option<u64> {
        let i = *head;
        let node = *self.nodes.get(i as usize)?;
        *head = node.next;
        self.nodes[i as usize].next = self.free;
        self.free = i;
        self.used -= 1;
        Some(node.consumer)
    }

    /// The consumers of a list, without removing them.
    pub fn iter(&self, head: u32) -> impl Iterator<Item = u64> + '_ {
        let mut i = head;
        core::iter::from_fn(move || {
            let node = self.nodes.get(i as usize)?;
            i = node.next;
            Some(node.consumer)
        })
    }
}

impl<const N: usize> Default for DepPool<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_and_reuse() {
        let mut pool = DepPool::<3>::new();
        let (mut a, mut b) = (NIL, NIL);
        assert!(pool.push(&mut a, 1) && pool.push(&mut a, 2) && pool.push(&mut b, 3));
        assert!(!pool.push(&mut b, 4), "empty pool refuses");
        assert_eq!(pool.iter(a).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(pool.pop(&mut a), Some(2));
        assert!(pool.push(&mut b, 5), "a freed node is reused");
        assert_eq!(pool.iter(b).collect::<Vec<_>>(), vec![5, 3]);
        assert_eq!((pool.pop(&mut a), pool.pop(&mut a)), (Some(1), None));
        assert_eq!(pool.used(), 2);
    }

    #[test]
    fn a_reset_pool_hands_out_every_node_again() {
        let mut pool = DepPool::<3>::new();
        let (mut a, mut b) = (NIL, NIL);
        assert!(pool.push(&mut a, 1) && pool.push(&mut b, 2));
        assert_eq!(pool.pop(&mut a), Some(1));
        pool.reset();
        assert_eq!((pool.used(), pool.available()), (0, 3));
        let mut c = NIL;
        assert!(pool.push(&mut c, 7) && pool.push(&mut c, 8) && pool.push(&mut c, 9));
        assert!(!pool.push(&mut c, 10), "three nodes, no more");
        assert_eq!(pool.iter(c).collect::<Vec<_>>(), vec![9, 8, 7]);
        DepPool::<0>::new().reset();
    }
}
